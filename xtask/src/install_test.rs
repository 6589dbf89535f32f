//! `cargo xtask install-test`: what `dist` made, installed on a clean
//! Debian 12 as an admin would. The guest's root is a bookworm made by
//! mmdebstrap from Debian's packages (dpkg, apt and only what the checks
//! call: no Rust, no build tools, nothing of stackprobe's), cached under
//! target/vm by its package list and copied for each run, so every run
//! starts clean. It boots under qemu with one of vm-test's kernels and its
//! 9p initramfs, and a /init of ours that mounts that copy as the root.
//!
//! In the guest, for the .deb and then the tarball: install (apt, offline;
//! INSTALL's commands), `doctor`, `demo` (its counts checked here, exactly),
//! the man page found and rendered, bash-completion completing a
//! subcommand, the agent started as its unit's ExecStart says with the
//! defaults file's arguments and its /metrics scraped, then purge or
//! INSTALL's removal, and no file left. The guest reports each check on
//! its console; what needs judging (the demo's JSON, the metrics, file
//! lists) it leaves in its root, read here.

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::{
    cache_key::fnv1a,
    dist,
    process::{capture, is_root, run_cmd, workspace_root},
    setup, tarball, vm,
};

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// mmdebstrap's `apt` variant: the Essential packages, dpkg and apt.
const VARIANT: &str = "apt";
/// What the checks call besides: man-db (and its groff) finds and renders
/// pages, bash-completion loads completions, curl scrapes the agent.
const PACKAGES: [&str; 3] = ["man-db", "bash-completion", "curl"];
const KERNEL: &str = "6.1";
/// The guest's whole run took 7 minutes under TCG on a busy 2-core host.
const TIMEOUT_SECONDS: u64 = 1200;
/// Where the guest finds the artifacts and its script, and leaves what it
/// saw, inside its root.
const GUEST_DIR: &str = "install-test";

/// Each check the guest reports, in order: all must say ok.
const CHECKS: [&str; 18] = [
    "deb-install",
    "deb-path",
    "deb-doctor",
    "deb-demo",
    "deb-man",
    "deb-completion",
    "deb-agent",
    "deb-list",
    "deb-purge",
    "tar-install",
    "tar-path",
    "tar-doctor",
    "tar-demo",
    "tar-man",
    "tar-completion",
    "tar-agent",
    "tar-list",
    "tar-remove",
];

#[derive(clap::Args, Default)]
pub struct Args {
    /// Test what target/dist holds instead of running `dist` first.
    #[arg(long)]
    no_dist: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if !is_root() {
        bail!("install-test runs mmdebstrap and qemu as root: run it with sudo");
    }
    if !args.no_dist {
        dist::run(false)?;
    }
    let (deb, tar) = dist::artifacts()?;
    setup::apt_packages(&["mmdebstrap", "cpio"])?;
    let vm_dir = workspace_root().join("target/vm");
    let started = Instant::now();
    let base = base_root(&vm_dir)?;
    let (vmlinuz, initrd, release) = vm::kernel_and_initramfs(KERNEL)?;
    let initrd = with_our_init(&initrd, &vm_dir)?;

    let root = vm_dir.join("install-run");
    let log = vm_dir.join("install-test.log");
    let mut attempt = 1;
    loop {
        let guest = fresh_root(&base, &root, &deb, &tar)?;
        eprintln!("xtask: install-test: booting Debian {SUITE} on {release} under qemu");
        let booted = boot(&vmlinuz, &initrd, &root, &log)?;
        let Err(e) = judge(&booted, &guest.join("out"), &deb, &tar) else {
            break;
        };
        if booted.int3_oops && attempt == 1 {
            let kept = log.with_extension("oops.log");
            fs::rename(&log, &kept)?;
            eprintln!(
                "xtask: install-test: the guest's kernel oopsed on a stale int3 of a live code \
                 patch (multi-threaded TCG, as vm-test meets it; log: {}): booting it once more",
                kept.display()
            );
            attempt += 1;
            continue;
        }
        eprintln!(
            "xtask: install-test failed; the guest's log ({}):",
            log.display()
        );
        eprintln!("{}", fs::read_to_string(&log).unwrap_or_default());
        eprintln!(
            "xtask: what the guest left is in {}",
            guest.join("out").display()
        );
        return Err(e);
    }
    fs::remove_dir_all(&root)?;
    println!(
        "install-test: {} checks passed on Debian {SUITE} ({release}) for {} and {} in {:.0} s",
        CHECKS.len(),
        file_name(&deb),
        file_name(&tar),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A copy of the clean root with the artifacts and the guest script in
/// it; returns where they are.
fn fresh_root(base: &Path, root: &Path, deb: &Path, tar: &Path) -> Result<PathBuf> {
    if root.exists() {
        fs::remove_dir_all(root).with_context(|| format!("clearing {}", root.display()))?;
    }
    run_cmd(Command::new("cp").arg("-a").arg(base).arg(root))?;
    let guest = root.join(GUEST_DIR);
    fs::create_dir_all(&guest)?;
    for file in [deb, tar] {
        fs::copy(
            file,
            guest.join(file.file_name().context("an artifact with no name")?),
        )?;
    }
    let script = guest.join("guest.sh");
    fs::write(&script, guest_script(deb, tar)?)?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    Ok(guest)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn root_key() -> String {
    format!("{SUITE} {VARIANT} {MIRROR} {}", PACKAGES.join(","))
}

/// The clean root, made once per package list.
fn base_root(vm_dir: &Path) -> Result<PathBuf> {
    let key = root_key();
    let dir = vm_dir.join(format!("install-root-{:016x}", fnv1a(&key)));
    let stamp = dir.join(".complete");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        return Ok(dir);
    }
    let _ = fs::remove_dir_all(&dir);
    eprintln!(
        "xtask: install-test: making a Debian {SUITE} root with mmdebstrap (about a minute, once)"
    );
    run_cmd(
        Command::new("mmdebstrap")
            .arg(format!("--variant={VARIANT}"))
            .arg(format!("--include={}", PACKAGES.join(",")))
            .args([SUITE])
            .arg(&dir)
            .arg(MIRROR),
    )
    .context("mmdebstrap")?;
    fs::write(&stamp, &key)?;
    Ok(dir)
}

/// vm-test's initramfs (busybox and the 9p modules) with our /init
/// appended as a second archive: the kernel unpacks both, and `rdinit=`
/// picks ours, which mounts the 9p share as the root instead of the host's
/// /usr and /etc.
fn with_our_init(initrd: &Path, vm_dir: &Path) -> Result<PathBuf> {
    let staging = vm_dir.join("install-init");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)?;
    let init = staging.join("install-init");
    fs::write(&init, INIT)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let ours = vm_dir.join("install-init.cpio");
    capture(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && echo install-init | cpio -o -H newc --quiet > '{}'",
        staging.display(),
        ours.display()
    )))
    .context("packing our /init")?;
    let mut both = fs::read(initrd).with_context(|| format!("reading {}", initrd.display()))?;
    both.extend(fs::read(&ours)?);
    let out = vm_dir.join("install-initramfs.cpio");
    fs::write(&out, both)?;
    Ok(out)
}

/// PID 1 until the switch: the modules (in whatever order their
/// dependencies allow), the 9p root, the file systems systemd would mount
/// that stackprobe uses, loopback up, then the guest script.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for pass in 1 2 3 4 5; do for m in /mods/*; do $B insmod $m 2>/dev/null; done; done
R=/newroot
$B mkdir -p $R
if ! $B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 root $R; then
    echo 'install-init: could not mount the root'
    $B poweroff -f
fi
$B mount -t tmpfs tmpfs $R/tmp
$B mount -t tmpfs tmpfs $R/run
$B ip link set lo up
$B mount --move /proc $R/proc
$B mount --move /sys $R/sys
$B mount --move /dev $R/dev
$B mount -t tracefs tracefs $R/sys/kernel/tracing
$B mount -t debugfs debugfs $R/sys/kernel/debug
$B mount -t bpf bpf $R/sys/fs/bpf
$B mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
exec $B switch_root $R /bin/sh /install-test/guest.sh
"#;

/// The checks, as root in the guest. Each check's output goes to
/// out/NAME.log, shown on the console when it fails.
fn guest_script(deb: &Path, tar: &Path) -> Result<String> {
    let tar_name = file_name(tar);
    let top = tar_name
        .strip_suffix(".tar.gz")
        .with_context(|| format!("{tar_name} is not a .tar.gz"))?;
    let indent = |s: &str| -> String { s.lines().map(|l| format!("    {l}\n")).collect() };
    Ok(format!(
        r#"#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
T=/{GUEST_DIR}
O=$T/out
mkdir -p $O
echo "== kernel $(uname -r)"
fails=0

check() {{
    name=$1
    shift
    # dash remembers where it found a command: forget what an install or
    # removal moved.
    hash -r
    if "$@" > "$O/$name.log" 2>&1; then
        echo "== check $name ok"
    else
        echo "== check $name FAIL (exit $?)"
        sed 's/^/    | /' "$O/$name.log" | tail -n 80
        fails=$((fails + 1))
    fi
}}

# which PATH: the stackprobe the shell finds.
is_at() {{
    found=$(command -v stackprobe)
    echo "stackprobe: $found"
    [ "$found" = "$1" ]
}}

# tag
demo() {{
    stackprobe demo --duration 6s --no-tui --json --rate 100 > "$O/$1-demo.json" 2> "$O/$1-demo.err"
    rc=$?
    cat "$O/$1-demo.err"
    return $rc
}}

# tag page-path (Debian's /usr/local/man links to /usr/local/share/man)
man_page() {{
    found=$(man -w stackprobe)
    echo "man -w stackprobe: $found"
    [ "$(readlink -f "$found")" = "$2" ] || return 1
    man -P cat stackprobe-demo > "$O/$1-man.txt"
}}

# tag: bash-completion finds the script itself, and it completes `do`.
completion() {{
    bash -c '
        . /usr/share/bash-completion/bash_completion
        if complete -p stackprobe 2>/dev/null; then echo "completed before it was looked up"; exit 1; fi
        __load_completion stackprobe || {{ echo "bash-completion found no completion for stackprobe"; exit 1; }}
        complete -p stackprobe
        f=$(complete -p stackprobe | sed -n "s/.* -F \([^ ]*\) .*/\1/p")
        [ -n "$f" ] || exit 1
        COMP_WORDS=(stackprobe do); COMP_CWORD=1; COMP_LINE="stackprobe do"; COMP_POINT=${{#COMP_LINE}}
        "$f" stackprobe do stackprobe
        printf "%s\n" "${{COMPREPLY[@]}}" > "$1"
    ' completion "$O/$1-completion.txt"
}}

# tag unit: its ExecStart, with its EnvironmentFile's variables, as
# systemd would run it; /metrics scraped; SIGTERM must end it with 0.
agent() {{
    unit=$2
    line=$(sed -n 's/^ExecStart=//p' "$unit")
    env=$(sed -n 's/^EnvironmentFile=//p' "$unit")
    echo "ExecStart=$line"
    echo "EnvironmentFile=$env"
    [ -n "$line" ] && [ -f "$env" ] || return 1
    set -a
    . "$env"
    set +a
    addr=$(printf '%s\n' "$STACKPROBE_AGENT_ARGS" | sed -n 's/.*--listen \([^ ]*\).*/\1/p')
    echo "STACKPROBE_AGENT_ARGS=$STACKPROBE_AGENT_ARGS; scraping $addr"
    [ -n "$addr" ] || return 1
    sh -c "exec $line" > "$O/$1-agent.err" 2>&1 &
    pid=$!
    i=0
    # Its own memory is measured each interval: 0 until the first.
    until curl -fsS "http://$addr/metrics" > "$O/$1-metrics.txt" 2>/dev/null &&
        grep -q '^stackprobe_resident_memory_bytes [1-9]' "$O/$1-metrics.txt"; do
        i=$((i + 1))
        if [ $i -ge 180 ] || ! kill -0 $pid 2>/dev/null; then
            echo "no metrics after $i s"
            cat "$O/$1-agent.err"
            kill $pid 2>/dev/null
            return 1
        fi
        sleep 1
    done
    echo "scraped after $i s"
    kill -TERM $pid
    wait $pid
    rc=$?
    cat "$O/$1-agent.err"
    echo "the agent exited $rc on SIGTERM"
    [ $rc -eq 0 ]
}}

# list: none of its files may be left.
none_left() {{
    left=0
    while read -r f; do
        if [ -e "$f" ] || [ -L "$f" ]; then echo "left behind: $f"; left=1; fi
    done < "$1"
    if [ -e /etc/default/stackprobe-agent ]; then echo "left behind: /etc/default/stackprobe-agent"; left=1; fi
    hash -r
    if command -v stackprobe; then echo "stackprobe still on PATH"; left=1; fi
    [ $left -eq 0 ]
}}

deb_list() {{
    dpkg -L stackprobe > $O/deb-dpkg-L.txt || return 1
    while read -r f; do [ -d "$f" ] || echo "$f"; done < $O/deb-dpkg-L.txt > $O/deb-files.txt
    cat $O/deb-files.txt
}}

deb_purge() {{
    apt-get purge -y stackprobe || return 1
    if dpkg -s stackprobe; then echo "dpkg still has stackprobe"; return 1; fi
    none_left $O/deb-files.txt
}}

tar_install() (
    set -ex
    mkdir -p /tmp/tar
    tar -xzf $T/{tar_name} -C /tmp/tar
    cd /tmp/tar/{top}
    # INSTALL's commands, as written there:
{install}
)

tar_list() (
    cd /tmp/tar/{top} && find usr etc -type f -printf '/%p\n' > $O/tar-files.txt && cat $O/tar-files.txt
)

tar_remove() {{
    (
        set -ex
        cd /tmp/tar/{top}
        # INSTALL's commands, as written there:
{uninstall}
    ) || return 1
    none_left $O/tar-files.txt
}}

cd /tmp
check deb-install apt-get install -y $T/{deb_name}
check deb-path is_at /usr/bin/stackprobe
check deb-doctor stackprobe doctor
check deb-demo demo deb
check deb-man man_page deb /usr/share/man/man1/stackprobe.1.gz
check deb-completion completion deb
check deb-agent agent deb /usr/lib/systemd/system/stackprobe-agent.service
check deb-list deb_list
check deb-purge deb_purge

check tar-install tar_install
check tar-path is_at /usr/local/bin/stackprobe
check tar-doctor stackprobe doctor
check tar-demo demo tar
check tar-man man_page tar /usr/local/share/man/man1/stackprobe.1.gz
check tar-completion completion tar
check tar-agent agent tar /usr/local/lib/systemd/system/stackprobe-agent.service
check tar-list tar_list
check tar-remove tar_remove

sync
echo "== result $fails"
if [ $fails -eq 0 ]; then printf '\000'; else printf '\001'; fi | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
sleep 10
"#,
        deb_name = file_name(deb),
        install = indent(tarball::INSTALL_COMMANDS),
        uninstall = indent(tarball::UNINSTALL_COMMANDS),
    ))
}

/// What the guest said.
struct Booted {
    /// `== check NAME ok|FAIL`, in order.
    checks: Vec<(String, bool)>,
    /// `== result N`: how many failed, by the guest's count.
    result: Option<u64>,
    /// qemu's exit: 1 when the guest wrote 0 to the debug-exit port.
    exit: Option<i32>,
    /// The kernel oopsed on an int3 (vm.rs says when and why).
    int3_oops: bool,
    took: Duration,
}

fn boot(vmlinuz: &Path, initrd: &Path, root: &Path, log_path: &Path) -> Result<Booted> {
    let mut log = fs::File::create(log_path)?;
    let started = Instant::now();
    let mut child = Command::new("timeout")
        .args(["--kill-after=10", &TIMEOUT_SECONDS.to_string()])
        .args([
            "qemu-system-x86_64",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
        ])
        .args(["-m", "2048", "-smp", "2", "-nographic", "-no-reboot"])
        // Offline, as the checks must pass without a network.
        .args(["-nic", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=root,security_model=none",
            root.display()
        ))
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet rdinit=/install-init",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let mut checks = Vec::new();
    let mut result = None;
    let mut int3_oops = false;
    for line in BufReader::new(child.stdout.take().context("qemu's stdout")?).lines() {
        let line = line?;
        let line = line.trim_end_matches('\r');
        println!("  [install] {line}");
        writeln!(log, "{line}")?;
        int3_oops |= line.contains("Oops: int3");
        if let Some(rest) = line.strip_prefix("== check ") {
            if let Some((name, verdict)) = rest.split_once(' ') {
                checks.push((name.to_string(), verdict == "ok"));
            }
        } else if let Some(n) = line.strip_prefix("== result ") {
            result = n.trim().parse().ok();
        }
    }
    let status = child.wait()?;
    if matches!(status.code(), Some(124 | 137)) {
        writeln!(
            log,
            "xtask: the guest ran past {TIMEOUT_SECONDS} s and was stopped"
        )?;
    }
    Ok(Booted {
        checks,
        result,
        exit: status.code(),
        int3_oops,
        took: started.elapsed(),
    })
}

/// Every check reported ok, in order, and what the guest left holds what
/// it should.
fn judge(booted: &Booted, out: &Path, deb: &Path, tar: &Path) -> Result<()> {
    let failed: Vec<&str> = booted
        .checks
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n.as_str())
        .collect();
    ensure!(failed.is_empty(), "the guest's checks failed: {failed:?}");
    let names: Vec<&str> = booted.checks.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(
        names == CHECKS,
        "the guest reported checks {names:?}, not {CHECKS:?} (qemu exit {:?} after {:.0} s)",
        booted.exit,
        booted.took.as_secs_f64()
    );
    ensure!(
        booted.result == Some(0) && booted.exit == Some(1),
        "the guest ended with result {:?}, qemu with {:?}",
        booted.result,
        booted.exit
    );
    let read = |name: &str| -> Result<String> {
        fs::read_to_string(out.join(name)).with_context(|| format!("the guest left no {name}"))
    };
    for tag in ["deb", "tar"] {
        check_demo(
            &read(&format!("{tag}-demo.json"))?,
            &read(&format!("{tag}-demo.err"))?,
        )
        .with_context(|| format!("{tag}: the demo"))?;
        check_man(&read(&format!("{tag}-man.txt"))?).with_context(|| format!("{tag}: man"))?;
        let completed: Vec<String> = read(&format!("{tag}-completion.txt"))?
            .lines()
            .map(str::to_string)
            .collect();
        ensure!(
            completed == ["doctor"],
            "{tag}: `stackprobe do<TAB>` completed to {completed:?}, not doctor"
        );
        check_metrics(&read(&format!("{tag}-metrics.txt"))?)
            .with_context(|| format!("{tag}: the agent's /metrics"))?;
    }
    let listed: BTreeSet<String> = read("deb-files.txt")?.lines().map(str::to_string).collect();
    let packed = dist::files_in_listing(&capture(Command::new("dpkg-deb").arg("-c").arg(deb))?);
    ensure!(
        listed == packed,
        "dpkg -L in the guest lists {listed:?}, the .deb holds {packed:?}"
    );
    let listed: BTreeSet<String> = read("tar-files.txt")?.lines().map(str::to_string).collect();
    let packed = tar_installed_files(&capture(Command::new("tar").arg("-tzf").arg(tar))?);
    ensure!(
        listed == packed,
        "the guest installed {listed:?} from the tarball, which holds {packed:?}"
    );
    Ok(())
}

/// The tarball's files as installed: below its top directory, INSTALL
/// aside.
fn tar_installed_files(listing: &str) -> BTreeSet<String> {
    listing
        .lines()
        .filter(|l| !l.ends_with('/'))
        .filter_map(|l| l.split_once('/').map(|(_, rest)| rest))
        .filter(|p| *p != "INSTALL")
        .map(|p| format!("/{p}"))
        .collect()
}

/// As cli/tests/demo_e2e.rs: the probes counted exactly the connections the
/// demo's load completed, one fork per connection on the forking server and
/// none on the pooled one.
fn check_demo(json: &str, stderr: &str) -> Result<()> {
    ensure!(!stderr.contains("warning"), "it warned:\n{stderr}");
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("demo: ")?.strip_suffix(" to demo-pooled"))
        .with_context(|| format!("no totals line in:\n{stderr}"))?;
    let (forking, pooled) = line
        .split_once(" connections to demo-forking, ")
        .with_context(|| format!("an odd totals line: {line}"))?;
    let forking: u64 = forking.parse().with_context(|| format!("in {line}"))?;
    let pooled: u64 = pooled.parse().with_context(|| format!("in {line}"))?;
    ensure!(
        forking > 0 && pooled > 0,
        "the load made no connections: {line}"
    );
    let summary: Value = json
        .lines()
        .last()
        .context("no reports")
        .and_then(|l| serde_json::from_str(l).context("the summary is not JSON"))?;
    ensure!(
        summary["type"] == "summary",
        "the last report is no summary"
    );
    ensure!(summary["drops"] == 0, "drops: {}", summary["drops"]);
    let roles = summary["roles"].as_array().context("no roles")?;
    let role = |name: &str| -> Result<&Value> {
        roles
            .iter()
            .find(|r| r["role"] == name)
            .with_context(|| format!("no role {name} in the summary"))
    };
    let master = role("demo-forking master")?;
    for (field, want) in [
        ("accept", forking),
        ("fork", forking),
        ("child_lifetime", forking),
        ("thread", 0),
    ] {
        ensure!(
            master[field]["total"] == want,
            "demo-forking master's {field} total is {}, not {want}",
            master[field]["total"]
        );
    }
    ensure!(master["children_alive"] == 0, "children alive: {master}");
    let accepted: u64 = roles
        .iter()
        .filter(|r| {
            r["role"]
                .as_str()
                .is_some_and(|n| n.starts_with("demo-forking"))
        })
        .filter_map(|r| r["accept"]["total"].as_u64())
        .sum();
    ensure!(
        accepted == forking,
        "demo-forking's roles accepted {accepted}, not {forking}"
    );
    let pooled_role = role("demo-pooled")?;
    ensure!(
        pooled_role["accept"]["total"] == pooled && pooled_role["fork"]["total"] == 0,
        "demo-pooled accepted {} and forked {}, not {pooled} and 0",
        pooled_role["accept"]["total"],
        pooled_role["fork"]["total"]
    );
    Ok(())
}

/// The page rendered as text: its name line and its synopsis.
fn check_man(text: &str) -> Result<()> {
    ensure!(
        text.lines().any(|l| l.trim() == "NAME")
            && text.contains("stackprobe-demo")
            && text.lines().any(|l| l.trim() == "SYNOPSIS"),
        "not the rendered stackprobe-demo(1):\n{text}"
    );
    Ok(())
}

/// The agent's own series, as the guest scraped them once its first
/// interval was done: its memory above 0 and no event dropped.
fn check_metrics(text: &str) -> Result<()> {
    let value = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    let rss = value("stackprobe_resident_memory_bytes");
    ensure!(
        rss.is_some_and(|r| r > 0.0),
        "stackprobe_resident_memory_bytes is {rss:?}:\n{text}"
    );
    let dropped = value("stackprobe_dropped_events_total");
    ensure!(
        dropped == Some(0.0),
        "stackprobe_dropped_events_total is {dropped:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(master_forks: u64) -> String {
        format!(
            r#"{{"type":"interval","roles":[]}}
{{"type":"summary","drops":0,"roles":[{{"role":"demo-forking master","accept":{{"total":40}},"fork":{{"total":{master_forks}}},"child_lifetime":{{"total":40}},"thread":{{"total":0}},"children_alive":0}},{{"role":"demo-forking worker","accept":{{"total":0}},"fork":{{"total":0}}}},{{"role":"demo-pooled","accept":{{"total":41}},"fork":{{"total":0}}}}]}}"#
        )
    }
    const TOTALS: &str = "demo: 40 connections to demo-forking, 41 to demo-pooled\n";

    #[test]
    fn the_demo_passes_only_with_exact_counts() {
        check_demo(&summary(40), TOTALS).unwrap();
        let err = check_demo(&summary(39), TOTALS).unwrap_err();
        assert!(format!("{err:#}").contains("fork total is 39"), "{err:#}");
        assert!(
            check_demo(
                &summary(40),
                "demo: 40 connections to demo-forking, 40 to demo-pooled"
            )
            .is_err()
        );
        assert!(check_demo(&summary(40), "no totals").is_err());
        assert!(check_demo("not json", TOTALS).is_err());
        assert!(check_demo(&summary(40), &format!("warning: x\n{TOTALS}")).is_err());
    }

    #[test]
    fn metrics_need_memory_and_no_drops() {
        let ok = "# HELP x\nstackprobe_resident_memory_bytes 31000000\nstackprobe_dropped_events_total 0\n";
        check_metrics(ok).unwrap();
        assert!(check_metrics(&ok.replace("total 0", "total 3")).is_err());
        assert!(check_metrics("stackprobe_dropped_events_total 0\n").is_err());
    }

    #[test]
    fn the_tarballs_files_land_below_its_top_directory() {
        let listing = "s-0.1/\ns-0.1/INSTALL\ns-0.1/usr/local/bin/\ns-0.1/usr/local/bin/stackprobe\ns-0.1/etc/default/stackprobe-agent\n";
        assert_eq!(
            tar_installed_files(listing),
            BTreeSet::from([
                "/usr/local/bin/stackprobe".to_string(),
                "/etc/default/stackprobe-agent".to_string()
            ])
        );
    }

    #[test]
    fn the_guest_script_runs_installs_commands_and_every_check() {
        let script = guest_script(
            Path::new("/x/stackprobe_0.1.0-1_amd64.deb"),
            Path::new("/x/stackprobe-0.1.0-x86_64-unknown-linux-musl.tar.gz"),
        )
        .unwrap();
        for line in tarball::INSTALL_COMMANDS
            .lines()
            .chain(tarball::UNINSTALL_COMMANDS.lines())
        {
            assert!(script.contains(line), "{line}");
        }
        for check in CHECKS {
            assert!(script.contains(&format!("\ncheck {check} ")), "{check}");
        }
        assert!(guest_script(Path::new("a.deb"), Path::new("a.zip")).is_err());
    }
}
