//! `cargo xtask dist`: the release binary packed as a Debian package by
//! cargo-deb, and a static musl build of it in a tarball (tarball.rs), in
//! target/dist with their SHA256SUMS. What the package ships
//! beside the binary is generated here from that same binary (man pages,
//! completions) or from dist/ (the agent's unit, with the packaged path),
//! into target/dist/pkg, where cli/Cargo.toml's `[package.metadata.deb]`
//! points. The package is then read back and checked: its files, its
//! conffiles and what its maintainer scripts do to the agent.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    cross,
    install::UNIT,
    process::{capture, cargo, run_cmd, workspace_root},
    setup, tarball,
};

/// Relative to the workspace root, as cli/Cargo.toml's asset paths are.
const DIST: &str = "target/dist";
const STAGE: &str = "target/dist/pkg";
/// The unit's ExecStart as `cargo xtask install` places it, and as the
/// package does.
const INSTALL_EXEC: &str = "ExecStart=/usr/local/bin/stackprobe ";
const PACKAGE_EXEC: &str = "ExecStart=/usr/bin/stackprobe ";
const UNIT_NAME: &str = "stackprobe-agent";
const CONFFILE: &str = "/etc/default/stackprobe-agent";

/// `arm64`: also the arm64 package (a cross build of its own, minutes the
/// install test, which installs the x86_64 artifacts only, does without).
pub fn run(arm64: bool) -> Result<()> {
    setup::cargo_deb()?;
    // dpkg-shlibdeps, for the package's Depends ($auto).
    setup::apt_packages(&["dpkg-dev"])?;
    let root = workspace_root();
    run_cmd(cargo().args([
        "build",
        "--release",
        "--locked",
        "-p",
        "stackprobe",
        "--bin",
        "stackprobe",
    ]))?;
    let binary = root.join("target/release/stackprobe");
    let dist = root.join(DIST);
    // A page of a subcommand since removed, or an older .deb, must not be
    // packed or summed again.
    if dist.exists() {
        fs::remove_dir_all(&dist).with_context(|| format!("clearing {}", dist.display()))?;
    }
    let stage = root.join(STAGE);
    stage_files(&binary, &stage)?;

    let deb = cargo_deb(&dist, None)?;
    verify(&deb, &stage, &root)?;
    check_arch(&deb, "amd64", "x86-64")?;

    let host_version = stdout_of(Command::new(&binary).arg("--version"))?;
    // "stackprobe 0.1.0 (commit 1a2b3c4)"
    let version = host_version
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("`stackprobe --version` printed {host_version:?}"))?;
    let target = &cross::X86_64_MUSL;
    let static_binary = cross::build(target)?;
    let tarball = tarball::pack(
        &static_binary,
        target,
        version,
        &host_version,
        &stage,
        &dist,
    )?;

    let mut packed = vec![deb.clone(), tarball.clone()];
    if arm64 {
        packed.push(arm64_deb(&root, &dist, &stage)?);
    }
    let mut sums = String::new();
    for file in &packed {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{}'s name is not UTF-8", file.display()))?;
        sums += &capture(Command::new("sha256sum").arg(name).current_dir(&dist))?;
    }
    fs::write(dist.join("SHA256SUMS"), &sums)?;
    eprintln!(
        "xtask: {} (checked: files, conffiles, maintainer scripts), {} (checked: files, \
         static binary, unit){} and {}",
        deb.display(),
        tarball.display(),
        packed
            .get(2)
            .map(|d| format!(", {} (checked as the first)", d.display()))
            .unwrap_or_default(),
        dist.join("SHA256SUMS").display()
    );
    Ok(())
}

/// The arm64 package: the aarch64 glibc build packed as the x86_64 one is,
/// with the same generated files (man pages and completions do not depend
/// on the architecture, and this host cannot run an aarch64 binary to make
/// them). No static arm64 tarball: Debian 12 has no aarch64 musl cross
/// toolchain (musl-tools builds for the host only).
fn arm64_deb(root: &Path, dist: &Path, stage: &Path) -> Result<PathBuf> {
    let target = &cross::AARCH64_GNU;
    let built = cross::build(target)?;
    // Where cargo-deb looks with --target: its asset target/release/… moved
    // under the triple.
    let release = root.join("target").join(target.triple).join("release");
    fs::create_dir_all(&release)?;
    fs::copy(&built, release.join("stackprobe"))
        .with_context(|| format!("copying {} for cargo-deb", built.display()))?;
    let deb = cargo_deb(dist, Some(target.triple))?;
    verify(&deb, stage, root)?;
    check_arch(&deb, "arm64", "ARM aarch64")?;
    Ok(deb)
}

/// The package's Architecture field is `arch`, and its binary is what
/// `file` calls `machine`.
fn check_arch(deb: &Path, arch: &str, machine: &str) -> Result<()> {
    let field = capture(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(deb)
            .arg("Architecture"),
    )?;
    ensure!(
        field.trim() == arch,
        "{} is for {}, not {arch}",
        deb.display(),
        field.trim()
    );
    let unpacked = deb.with_extension("unpacked");
    if unpacked.exists() {
        fs::remove_dir_all(&unpacked)?;
    }
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&unpacked))?;
    let described = capture(
        Command::new("file")
            .arg("-b")
            .arg(unpacked.join("usr/bin/stackprobe")),
    )?;
    fs::remove_dir_all(&unpacked)?;
    ensure!(
        described.contains(machine),
        "{}'s /usr/bin/stackprobe is {described}, not {machine}",
        deb.display()
    );
    Ok(())
}

/// The .deb and the tarball `run` wrote, for the install test.
pub fn artifacts() -> Result<(PathBuf, PathBuf)> {
    let dist = workspace_root().join(DIST);
    let mut deb = None;
    let mut tar = None;
    for entry in fs::read_dir(&dist).with_context(|| format!("reading {}", dist.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with("_amd64.deb") {
            deb = Some(path.clone());
        } else if name.ends_with(".tar.gz") {
            tar = Some(path.clone());
        }
    }
    match (deb, tar) {
        (Some(deb), Some(tar)) => Ok((deb, tar)),
        _ => bail!(
            "{} holds no .deb and tarball: run `cargo xtask dist`",
            dist.display()
        ),
    }
}

/// Man pages (cargo-deb gzips them), the three completion scripts, and the
/// unit with the packaged binary's path.
fn stage_files(binary: &Path, stage: &Path) -> Result<()> {
    stdout_of(Command::new(binary).arg("manpages").arg(stage.join("man")))?;
    let completions = stage.join("completions");
    fs::create_dir_all(&completions)?;
    for (shell, file) in [
        ("bash", "stackprobe"),
        ("zsh", "_stackprobe"),
        ("fish", "stackprobe.fish"),
    ] {
        let script = stdout_of(Command::new(binary).args(["completions", shell]))?;
        ensure!(
            !script.is_empty(),
            "`stackprobe completions {shell}` printed nothing"
        );
        fs::write(completions.join(file), script)?;
    }
    let systemd = stage.join("systemd");
    fs::create_dir_all(&systemd)?;
    let template = workspace_root().join("dist/systemd").join(UNIT);
    let unit =
        fs::read_to_string(&template).with_context(|| format!("reading {}", template.display()))?;
    fs::write(systemd.join(UNIT), packaged_unit(&unit)?)?;
    Ok(())
}

/// The unit as the package installs it: the binary in /usr/bin. The
/// template keeps /usr/local/bin, so `cargo xtask install` copies it as is.
fn packaged_unit(template: &str) -> Result<String> {
    let uses = template.matches(INSTALL_EXEC).count();
    ensure!(
        uses == 1,
        "dist/systemd/{UNIT} has {uses} lines starting `{INSTALL_EXEC}`, not one: \
         the packaged unit would not run /usr/bin/stackprobe"
    );
    Ok(template.replace(INSTALL_EXEC, PACKAGE_EXEC))
}

fn verify(deb: &Path, stage: &Path, root: &Path) -> Result<()> {
    let listing = capture(Command::new("dpkg-deb").arg("-c").arg(deb))?;
    let shipped = files_in_listing(&listing);
    let expected = expected_files(stage, root)?;
    let missing: Vec<_> = expected.difference(&shipped).collect();
    let unexpected: Vec<_> = shipped.difference(&expected).collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        bail!(
            "{} does not hold what it should:\n  missing: {missing:?}\n  unexpected: {unexpected:?}",
            deb.display()
        );
    }

    let conffiles = capture(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"))
        .with_context(|| format!("{} has no conffiles", deb.display()))?;
    let conffiles: Vec<&str> = conffiles.lines().map(str::trim).collect();
    ensure!(
        conffiles == [CONFFILE],
        "{}'s conffiles are {conffiles:?}, not {CONFFILE} alone (the agent's arguments, \
         which upgrades must keep)",
        deb.display()
    );

    let control = root.join(DIST).join("control");
    run_cmd(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control))?;
    check_scripts(&control).with_context(|| format!("{}'s maintainer scripts", deb.display()))?;
    fs::remove_dir_all(&control)?;
    Ok(())
}

/// Runs cargo-deb (for `triple`, else the host) and returns the path of the
/// package it wrote.
fn cargo_deb(dist: &Path, triple: Option<&str>) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["deb", "-p", "stackprobe", "--no-build", "--output"])
        .arg(dist);
    if let Some(triple) = triple {
        cmd.args(["--target", triple]);
    }
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stderr.lines() {
        // cargo-deb warns of every asset under target/ but target/release,
        // in case it was meant to build it; ours are written before it runs.
        let staged = line.contains("Only source paths starting with exactly 'target/release/'")
            && line.contains("'../target/dist/pkg/");
        if !staged || !out.status.success() {
            eprintln!("{line}");
        }
    }
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .map(str::trim)
        .rfind(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .with_context(|| format!("cargo deb named no .deb in its output:\n{stdout}"))
}

/// Its stdout; its stderr goes to ours, so a failure says why.
fn stdout_of(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed something not UTF-8"))
}

/// Regular files and links in `dpkg-deb -c`'s listing, as absolute paths.
pub(crate) fn files_in_listing(listing: &str) -> BTreeSet<String> {
    listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

fn expected_files(stage: &Path, root: &Path) -> Result<BTreeSet<String>> {
    let mut files: BTreeSet<String> = [
        "/usr/bin/stackprobe",
        "/usr/lib/systemd/system/stackprobe-agent.service",
        CONFFILE,
        "/usr/share/bash-completion/completions/stackprobe",
        "/usr/share/zsh/vendor-completions/_stackprobe",
        "/usr/share/fish/vendor_completions.d/stackprobe.fish",
        "/usr/share/doc/stackprobe/copyright",
        "/usr/share/doc/stackprobe/README.md",
        "/usr/share/doc/stackprobe/BENCHMARKS.md",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let names = |dir: &Path, suffix: &str| -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.ends_with(suffix) {
                names.push(name);
            }
        }
        Ok(names)
    };
    let pages = names(&stage.join("man"), ".1")?;
    ensure!(
        pages.contains(&"stackprobe-watch.1".to_string()),
        "`stackprobe manpages` wrote no stackprobe-watch.1: {pages:?}"
    );
    files.extend(pages.iter().map(|p| format!("/usr/share/man/man1/{p}.gz")));
    files.extend(
        names(&root.join("docs"), ".md")?
            .iter()
            .map(|d| format!("/usr/share/doc/stackprobe/docs/{d}")),
    );
    Ok(files)
}

/// What dpkg will do to the agent, found by running the package's own
/// postinst and prerm (in `control`, from `dpkg-deb -e`) as dpkg would,
/// with deb-systemd-helper, deb-systemd-invoke and systemctl replaced by
/// stubs that log their arguments, and systemd taken as running. The
/// promise: installing neither enables nor starts the agent (its default
/// arguments may name processes this machine does not run, and it opens
/// a port); an upgrade restarts it only if it runs (try-restart) and
/// keeps it enabled only if the admin had enabled it; removing stops it.
fn check_scripts(control: &Path) -> Result<()> {
    let unit = format!("{UNIT_NAME}.service");
    let scenarios = [
        Scenario {
            what: "a first install",
            script: &["postinst", "configure"],
            dpkg: Dpkg::new(false, true),
            must: &[],
            must_not: &["enable", "start", "restart", "try-restart"],
        },
        Scenario {
            what: "an upgrade, the agent enabled",
            script: &["postinst", "configure", "0.0.1-1"],
            dpkg: Dpkg::new(true, true),
            must: &["enable", "try-restart"],
            must_not: &["start", "restart"],
        },
        Scenario {
            what: "an upgrade, the agent not enabled",
            script: &["postinst", "configure", "0.0.1-1"],
            dpkg: Dpkg::new(true, false),
            must: &["try-restart"],
            must_not: &["enable", "start", "restart"],
        },
        Scenario {
            what: "the old package's prerm on upgrade",
            script: &["prerm", "upgrade", "0.2.0-1"],
            dpkg: Dpkg::new(true, true),
            must: &[],
            must_not: &["stop"],
        },
        Scenario {
            what: "a removal",
            script: &["prerm", "remove"],
            dpkg: Dpkg::new(true, true),
            must: &["stop"],
            must_not: &[],
        },
    ];
    let work = control.join("check");
    for Scenario {
        what,
        script,
        dpkg,
        must,
        must_not,
    } in scenarios
    {
        let actions = dpkg.run(control, &work, script)?;
        let on_unit: Vec<&str> = actions
            .iter()
            .filter(|(_, target)| *target == unit)
            .map(|(action, _)| action.as_str())
            .collect();
        let line = script.join(" ");
        for action in must {
            ensure!(
                on_unit.contains(action),
                "on {what} (`{line}`) nothing does `{action} {unit}`; it did {actions:?}"
            );
        }
        for action in must_not {
            ensure!(
                !on_unit.contains(action),
                "on {what} (`{line}`) it does `{action} {unit}`; it did {actions:?}"
            );
        }
    }
    Ok(())
}

/// One run of a maintainer script: what dpkg passes it, what
/// deb-systemd-helper answers, and which actions on the unit must and
/// must not follow.
struct Scenario {
    what: &'static str,
    script: &'static [&'static str],
    dpkg: Dpkg,
    must: &'static [&'static str],
    must_not: &'static [&'static str],
}

/// What deb-systemd-helper knows of the unit when a script runs.
struct Dpkg {
    /// Installed by a package before (`debian-installed`).
    known: bool,
    /// The admin had it enabled (`was-enabled`).
    enabled: bool,
}

impl Dpkg {
    fn new(known: bool, enabled: bool) -> Self {
        Self { known, enabled }
    }

    /// Runs `control/SCRIPT ARGS…` with the stubs first in PATH, and
    /// returns what was asked of deb-systemd-helper, deb-systemd-invoke
    /// and systemctl, as (action, unit) pairs.
    fn run(
        &self,
        control: &Path,
        work: &Path,
        script_and_args: &[&str],
    ) -> Result<Vec<(String, String)>> {
        let (script, args) = script_and_args.split_first().expect("a script");
        let _ = fs::remove_dir_all(work);
        let bin = work.join("bin");
        let systemd = work.join("run-systemd-system");
        fs::create_dir_all(&bin)?;
        fs::create_dir_all(&systemd)?;
        let log = work.join("log");
        let answer = |yes: bool| if yes { 0 } else { 1 };
        let stub = format!(
            "#!/bin/sh\n\
             [ \"$1\" = --quiet ] && shift\n\
             [ \"$1\" = --system ] && shift\n\
             echo \"$1 $2\" >> '{log}'\n\
             case \"$1\" in\n\
             debian-installed) exit {known} ;;\n\
             was-enabled) exit {enabled} ;;\n\
             esac\n\
             exit 0\n",
            log = log.display(),
            known = answer(self.known),
            enabled = answer(self.enabled),
        );
        for name in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
            let path = bin.join(name);
            fs::write(&path, &stub)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        }
        let text = fs::read_to_string(control.join(script))
            .with_context(|| format!("the package has no {script}"))?;
        // The scripts act on services only where systemd runs, which it
        // may not here: a directory of ours stands for it.
        let text = text.replace("/run/systemd/system", &systemd.display().to_string());
        let copy = work.join(script);
        fs::write(&copy, text)?;
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        run_cmd(Command::new("sh").arg(&copy).args(args).env("PATH", path))
            .with_context(|| format!("{script} {}", args.join(" ")))?;
        let logged = fs::read_to_string(&log).unwrap_or_default();
        Ok(logged
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, u)| (a.to_string(), u.trim().to_string()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packaged_unit_runs_the_packaged_binary() {
        let template =
            fs::read_to_string(workspace_root().join("dist/systemd").join(UNIT)).unwrap();
        let unit = packaged_unit(&template).unwrap();
        assert!(unit.contains("ExecStart=/usr/bin/stackprobe agent $STACKPROBE_AGENT_ARGS"));
        assert!(!unit.contains("/usr/local/bin"), "{unit}");
        assert!(packaged_unit("ExecStart=/opt/stackprobe agent\n").is_err());
    }

    /// The scripts cargo-deb 3.8 writes for `enable = false, start = false,
    /// restart-after-upgrade = true`, shortened to what acts on the unit.
    const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = \"configure\" ] || [ \"$1\" = \"abort-upgrade\" ] ; then
\tif deb-systemd-helper debian-installed stackprobe-agent.service; then
\t\tdeb-systemd-helper unmask stackprobe-agent.service >/dev/null || true
\t\tif deb-systemd-helper --quiet was-enabled stackprobe-agent.service; then
\t\t\tdeb-systemd-helper enable stackprobe-agent.service >/dev/null || true
\t\tfi
\tfi
\tdeb-systemd-helper update-state stackprobe-agent.service >/dev/null || true
fi
if [ \"$1\" = \"configure\" ] || [ \"$1\" = \"abort-upgrade\" ] ; then
\tif [ -d /run/systemd/system ]; then
\t\tsystemctl --system daemon-reload >/dev/null || true
\t\tif [ -n \"$2\" ]; then
\t\t\tdeb-systemd-invoke try-restart stackprobe-agent.service >/dev/null || true
\t\tfi
\tfi
fi
";
    const PRERM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
\tdeb-systemd-invoke stop stackprobe-agent.service >/dev/null || true
fi
";

    fn check(tag: &str, postinst: &str, prerm: &str) -> Result<()> {
        let control = std::env::temp_dir().join(format!("xtask-dist-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&control);
        fs::create_dir_all(&control).unwrap();
        fs::write(control.join("postinst"), postinst).unwrap();
        fs::write(control.join("prerm"), prerm).unwrap();
        let checked = check_scripts(&control);
        fs::remove_dir_all(&control).unwrap();
        checked
    }

    #[test]
    fn the_scripts_as_configured_pass() {
        check("ok", POSTINST, PRERM).unwrap();
    }

    /// cargo-deb's defaults (enable and start) and a lost try-restart or
    /// stop are each caught.
    #[test]
    fn scripts_that_enable_start_or_forget_fail() {
        let enabling = POSTINST.replace(
            "if deb-systemd-helper debian-installed stackprobe-agent.service; then",
            "if true; then",
        );
        let err = check("enable", &enabling, PRERM).unwrap_err();
        assert!(format!("{err:#}").contains("on a first install"), "{err:#}");
        let starting = POSTINST.replace(
            "\t\tif [ -n \"$2\" ]; then\n\t\t\tdeb-systemd-invoke try-restart",
            "\t\tif true; then\n\t\t\tdeb-systemd-invoke start",
        );
        assert_ne!(starting, POSTINST);
        let err = check("start", &starting, PRERM).unwrap_err();
        assert!(
            format!("{err:#}").contains("`start stackprobe-agent.service`"),
            "{err:#}"
        );
        let no_restart = POSTINST.replace("try-restart", "reload-or-whatever");
        assert!(check("restart", &no_restart, PRERM).is_err());
        let stop_on_upgrade = PRERM.replace(" && [ \"$1\" = remove ]", "");
        let err = check("stop", POSTINST, &stop_on_upgrade).unwrap_err();
        assert!(format!("{err:#}").contains("prerm on upgrade"), "{err:#}");
        assert!(check("no-stop", POSTINST, "#!/bin/sh\n").is_err());
    }

    #[test]
    fn a_listing_gives_files_and_links_not_directories() {
        let listing = "\
drwxr-xr-x 0/0               0 2026-12-06 21:00 ./
drwxr-xr-x 0/0               0 2026-12-06 21:00 ./usr/bin/
-rwxr-xr-x 0/0        12345678 2026-12-06 21:00 ./usr/bin/stackprobe
lrwxrwxrwx 0/0               0 2026-12-06 21:00 ./usr/bin/sp -> stackprobe
";
        assert_eq!(
            files_in_listing(listing),
            BTreeSet::from(["/usr/bin/stackprobe".to_string(), "/usr/bin/sp".to_string()])
        );
    }
}
