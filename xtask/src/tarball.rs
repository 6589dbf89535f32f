//! The static binary's tarball, for `cargo xtask dist`: for machines
//! without dpkg, or where only a static binary runs. Its files sit under
//! `usr/local/` as they go in /usr/local (the binary where `cargo xtask
//! install` puts it too, so the same unit serves both), beside
//! `etc/default/stackprobe-agent`, and INSTALL says how to copy them in
//! and out. Read back and checked as the .deb is.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    cross::{self, Target},
    install::UNIT,
    process::{capture, run_cmd, workspace_root},
};

/// The binary's path in the tarball and, with a leading /, once installed:
/// the unit's ExecStart must name it.
const BINARY: &str = "usr/local/bin/stackprobe";
const UNIT_DIR: &str = "usr/local/lib/systemd/system";
const DEFAULTS: &str = "etc/default/stackprobe-agent";
const MAN_DIR: &str = "usr/local/share/man/man1";
const DOC_DIR: &str = "usr/local/share/doc/stackprobe";
/// Where each shell looks under /usr/local by default (bash-completion and
/// fish through XDG_DATA_DIRS, zsh in Debian's fpath).
const COMPLETIONS: [(&str, &str); 3] = [
    (
        "stackprobe",
        "usr/local/share/bash-completion/completions/stackprobe",
    ),
    (
        "_stackprobe",
        "usr/local/share/zsh/site-functions/_stackprobe",
    ),
    (
        "stackprobe.fish",
        "usr/local/share/fish/vendor_completions.d/stackprobe.fish",
    ),
];

/// Run as root in the extracted directory: INSTALL gives them, and the
/// install test runs them as written. The defaults file, which holds the
/// admin's agent arguments, is copied only if there is none yet.
pub const INSTALL_COMMANDS: &str = "cp -R usr/local/. /usr/local/
[ -e /etc/default/stackprobe-agent ] || cp etc/default/stackprobe-agent /etc/default/
";
/// Removes every file the tarball installed, the agent's arguments too.
pub const UNINSTALL_COMMANDS: &str = "find usr etc -type f -printf '/%p\\n' | xargs rm -f
";

/// `stackprobe-VERSION-TRIPLE`: the tarball's name without `.tar.gz`, and
/// its one top directory.
pub fn name(version: &str, target: &Target) -> String {
    format!("stackprobe-{version}-{}", target.triple)
}

/// Packs `binary` (built for `target`) with the man pages and completion
/// scripts `dist` generated into `stage`, writes `DIST/NAME.tar.gz`, then
/// reads it back and checks it. `expected_version` is what the host build's
/// `--version` printed: the static binary must print the same.
pub fn pack(
    binary: &Path,
    target: &Target,
    version: &str,
    expected_version: &str,
    stage: &Path,
    dist: &Path,
) -> Result<PathBuf> {
    let name = name(version, target);
    let work = dist.join("tar");
    let _ = fs::remove_dir_all(&work);
    let top = work.join(&name);
    let root = workspace_root();
    let put = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let dest = top.join(to);
        fs::create_dir_all(dest.parent().context("a path with no parent")?)?;
        fs::copy(from, &dest)
            .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put(binary, BINARY, 0o755)?;
    let unit = root.join("dist/systemd").join(UNIT);
    check_unit(&fs::read_to_string(&unit).with_context(|| format!("reading {}", unit.display()))?)?;
    put(&unit, &format!("{UNIT_DIR}/{UNIT}"), 0o644)?;
    put(
        &root.join("dist/systemd/stackprobe-agent.default"),
        DEFAULTS,
        0o644,
    )?;
    for (file, to) in COMPLETIONS {
        put(&stage.join("completions").join(file), to, 0o644)?;
    }
    for page in man_pages(stage)? {
        put(
            &stage.join("man").join(&page),
            &format!("{MAN_DIR}/{page}"),
            0o644,
        )?;
        run_cmd(
            Command::new("gzip")
                .args(["-9", "-n"])
                .arg(top.join(MAN_DIR).join(&page)),
        )?;
    }
    put(
        &root.join("README.md"),
        &format!("{DOC_DIR}/README.md"),
        0o644,
    )?;
    put(
        &root.join("BENCHMARKS.md"),
        &format!("{DOC_DIR}/BENCHMARKS.md"),
        0o644,
    )?;
    for doc in markdown(&root.join("docs"))? {
        put(
            &root.join("docs").join(&doc),
            &format!("{DOC_DIR}/docs/{doc}"),
            0o644,
        )?;
    }
    fs::write(top.join("INSTALL"), install_text(&name))?;

    let tarball = dist.join(format!("{name}.tar.gz"));
    // Owned by root whoever builds it, and dated by the commit, so the
    // same commit packs the same files the same way.
    let epoch = capture(
        Command::new("git")
            .args(["log", "-1", "--format=%ct"])
            .current_dir(&root),
    )
    .unwrap_or_else(|_| "0".to_string());
    run_cmd(
        Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
            .arg(format!("--mtime=@{}", epoch.trim()))
            .arg("-C")
            .arg(&work)
            .arg("-czf")
            .arg(&tarball)
            .arg(&name),
    )?;
    fs::remove_dir_all(&work)?;
    verify(&tarball, &name, stage, target, expected_version, dist)
        .with_context(|| format!("checking {}", tarball.display()))?;
    Ok(tarball)
}

/// The unit runs the binary where the tarball installs it.
fn check_unit(unit: &str) -> Result<()> {
    let exec: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .collect();
    let wanted = format!("/{BINARY} ");
    ensure!(
        exec.len() == 1 && exec[0].starts_with(&wanted),
        "the unit's ExecStart is {exec:?}, not one line running /{BINARY}, where the tarball puts it"
    );
    Ok(())
}

fn install_text(name: &str) -> String {
    let indent = |s: &str| -> String { s.lines().map(|l| format!("    {l}\n")).collect() };
    format!(
        "stackprobe, a static x86_64 Linux binary (no shared libraries), with its
man pages, completions, the agent's systemd unit and its documentation.
It needs Linux 5.8 or later with BTF, and root (see README.md, installed in
/usr/local/share/doc/stackprobe/).

Install: as root, in this directory ({name}), run

{install}
Files go to:

    /usr/local/bin/stackprobe                                 the binary
    /usr/local/lib/systemd/system/stackprobe-agent.service    the agent's unit (ExecStart=/usr/local/bin/stackprobe ...)
    /etc/default/stackprobe-agent                             the agent's arguments (kept if present)
    /usr/local/share/man/man1/stackprobe*.1.gz                man pages, one per subcommand
    /usr/local/share/bash-completion/completions/stackprobe   bash (with bash-completion)
    /usr/local/share/zsh/site-functions/_stackprobe           zsh
    /usr/local/share/fish/vendor_completions.d/stackprobe.fish  fish
    /usr/local/share/doc/stackprobe/                          README.md, BENCHMARKS.md, docs/

Then `stackprobe doctor` says whether this machine can run it. The agent is
neither enabled nor started: set what it watches in
/etc/default/stackprobe-agent, then

    systemctl daemon-reload
    systemctl enable --now stackprobe-agent

Another prefix than /usr/local needs the unit's ExecStart changed to match.

Uninstall: stop the agent (systemctl disable --now stackprobe-agent), then
as root, in this directory, run

{uninstall}
which removes every file above, /etc/default/stackprobe-agent too.
",
        install = indent(INSTALL_COMMANDS),
        uninstall = indent(UNINSTALL_COMMANDS),
    )
}

fn man_pages(stage: &Path) -> Result<Vec<String>> {
    let pages = names_ending(&stage.join("man"), ".1")?;
    ensure!(
        pages.iter().any(|p| p == "stackprobe.1"),
        "no stackprobe.1 in {}: {pages:?}",
        stage.join("man").display()
    );
    Ok(pages)
}

fn markdown(dir: &Path) -> Result<Vec<String>> {
    names_ending(dir, ".md")
}

fn names_ending(dir: &Path, suffix: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(suffix) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Every file the tarball must hold, as paths inside it.
fn expected_files(name: &str, stage: &Path) -> Result<BTreeSet<String>> {
    let mut files: BTreeSet<String> = [
        "INSTALL".to_string(),
        BINARY.to_string(),
        format!("{UNIT_DIR}/{UNIT}"),
        DEFAULTS.to_string(),
        format!("{DOC_DIR}/README.md"),
        format!("{DOC_DIR}/BENCHMARKS.md"),
    ]
    .into_iter()
    .collect();
    files.extend(COMPLETIONS.iter().map(|(_, to)| to.to_string()));
    files.extend(
        man_pages(stage)?
            .iter()
            .map(|p| format!("{MAN_DIR}/{p}.gz")),
    );
    files.extend(
        markdown(&workspace_root().join("docs"))?
            .iter()
            .map(|d| format!("{DOC_DIR}/docs/{d}")),
    );
    Ok(files.into_iter().map(|f| format!("{name}/{f}")).collect())
}

/// Its files exactly, nothing outside its top directory, the binary
/// executable and static, printing the host build's version, and the unit
/// running it from where it lands.
fn verify(
    tarball: &Path,
    name: &str,
    stage: &Path,
    target: &Target,
    expected_version: &str,
    dist: &Path,
) -> Result<()> {
    let listing = capture(Command::new("tar").arg("-tzvf").arg(tarball))?;
    let (shipped, modes) = files_in_listing(&listing);
    if let Some(outside) = shipped.iter().find(|f| !f.starts_with(&format!("{name}/"))) {
        bail!("{outside} lies outside {name}/");
    }
    let expected = expected_files(name, stage)?;
    let missing: Vec<_> = expected.difference(&shipped).collect();
    let unexpected: Vec<_> = shipped.difference(&expected).collect();
    ensure!(
        missing.is_empty() && unexpected.is_empty(),
        "it does not hold what it should:\n  missing: {missing:?}\n  unexpected: {unexpected:?}"
    );
    let binary_mode = modes.get(&format!("{name}/{BINARY}")).map(String::as_str);
    ensure!(
        binary_mode == Some("-rwxr-xr-x"),
        "{BINARY} has mode {binary_mode:?}, not -rwxr-xr-x"
    );

    let check = dist.join("tar-check");
    let _ = fs::remove_dir_all(&check);
    fs::create_dir_all(&check)?;
    run_cmd(
        Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&check),
    )?;
    let top = check.join(name);
    let binary = top.join(BINARY);
    if target.static_binary {
        cross::check_static(&binary)?;
    }
    let version = capture(Command::new(&binary).arg("--version"))
        .with_context(|| format!("running {BINARY} --version"))?;
    ensure!(
        version.trim() == expected_version.trim(),
        "{BINARY} --version says {:?}, the host build {:?}",
        version.trim(),
        expected_version.trim()
    );
    check_unit(&fs::read_to_string(top.join(UNIT_DIR).join(UNIT))?)?;
    let install = fs::read_to_string(top.join("INSTALL"))?;
    ensure!(
        install.contains(INSTALL_COMMANDS.lines().next().unwrap_or_default()),
        "INSTALL does not give the install commands"
    );
    fs::remove_dir_all(&check)?;
    Ok(())
}

/// `tar -tzvf`'s regular files and links, with their modes.
fn files_in_listing(
    listing: &str,
) -> (BTreeSet<String>, std::collections::BTreeMap<String, String>) {
    let mut files = BTreeSet::new();
    let mut modes = std::collections::BTreeMap::new();
    for line in listing.lines().filter(|l| !l.starts_with('d')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let (Some(mode), Some(path)) = (fields.first(), fields.get(5)) {
            files.insert(path.to_string());
            modes.insert(path.to_string(), mode.to_string());
        }
    }
    (files, modes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_the_binary_where_the_tarball_puts_it() {
        let template =
            fs::read_to_string(workspace_root().join("dist/systemd").join(UNIT)).unwrap();
        check_unit(&template).unwrap();
        assert!(check_unit("ExecStart=/usr/bin/stackprobe agent\n").is_err());
        assert!(
            check_unit(
                "ExecStart=/usr/local/bin/stackprobe a\nExecStart=/usr/local/bin/stackprobe b\n"
            )
            .is_err()
        );
    }

    #[test]
    fn install_names_every_command_and_path() {
        let text = install_text("stackprobe-0.1.0-x86_64-unknown-linux-musl");
        for line in INSTALL_COMMANDS.lines().chain(UNINSTALL_COMMANDS.lines()) {
            assert!(text.contains(&format!("    {line}\n")), "{line}");
        }
        for (_, path) in COMPLETIONS {
            assert!(text.contains(&format!("/{path}")), "{path}");
        }
        assert!(text.contains(&format!("/{BINARY} ")));
    }

    #[test]
    fn a_listing_gives_files_with_modes_not_directories() {
        let listing = "\
drwxr-xr-x 0/0               0 2026-12-06 21:00 s/
drwxr-xr-x 0/0               0 2026-12-06 21:00 s/usr/local/bin/
-rwxr-xr-x 0/0        12345678 2026-12-06 21:00 s/usr/local/bin/stackprobe
-rw-r--r-- 0/0             100 2026-12-06 21:00 s/INSTALL
";
        let (files, modes) = files_in_listing(listing);
        assert_eq!(
            files,
            BTreeSet::from([
                "s/usr/local/bin/stackprobe".to_string(),
                "s/INSTALL".to_string()
            ])
        );
        assert_eq!(modes["s/usr/local/bin/stackprobe"], "-rwxr-xr-x");
    }
}
